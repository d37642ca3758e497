"""The CLI drops the third-party lines it names, and only those."""

from __future__ import annotations

import logging

from memgnn.predictor.quiet import NOISE, filter_noise


def test_named_noise_is_dropped_and_the_rest_still_shows(caplog):
    filter_noise()
    filter_noise()  # idempotent: one filter per entry
    name, prefix = NOISE[0]
    logger = logging.getLogger(name)
    assert sum(1 for f in logger.filters if getattr(f, "prefix", None) == prefix) == 1
    with caplog.at_level(logging.WARNING):
        logger.warning(prefix + "/x/_C.so: Could not load this library")
        logger.warning("a real problem")
        logging.getLogger(name + ".child").warning(prefix + "from a child logger")
    messages = [r.getMessage() for r in caplog.records]
    assert "a real problem" in messages
    assert not any(m.startswith(prefix + "/x/") for m in messages)
    assert any("from a child logger" in m for m in messages)  # filters name loggers exactly

import pytest
from memgnn.predictor.errors import UserError


def test_user_error_is_a_value_error():
    with pytest.raises(ValueError, match="bad size"):
        raise UserError("bad size")

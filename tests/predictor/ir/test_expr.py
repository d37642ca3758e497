import numpy as np
import pytest
import sympy
from memgnn.predictor.ir.expr import ExprTable, simplify_sum, sympy_to_source, validate_source


def test_sympy_to_source_renames_and_keeps_floor_division():
    s, b = sympy.symbols("s3 s7", integer=True, positive=True)
    from torch.utils._sympy.functions import FloorDiv

    expr = 32 * b * (FloorDiv(s - 3, 2) + 1) ** 2
    src = sympy_to_source(expr, {s: "S", b: "B"})
    table = ExprTable([src], ["B", "S"])
    for bv, sv in [(1, 3), (4, 17), (64, 1024)]:
        assert table.evaluate_exact({"B": bv, "S": sv}) == [32 * bv * ((sv - 3) // 2 + 1) ** 2]


def test_unknown_symbol_in_sympy_expression_is_named():
    x = sympy.Symbol("u0", integer=True)
    with pytest.raises(ValueError, match="u0"):
        sympy_to_source(x + 1, {})


@pytest.mark.parametrize(
    "bad, what",
    [
        ('__import__("os")', "Call"),
        ("B.real", "Attribute"),
        ("B + 1.5", "Constant"),
        ("Q * 2", "'Q'"),
        ("B +", "malformed"),
        ("[B]", "List"),
    ],
)
def test_validate_rejects_anything_but_integer_arithmetic(bad, what):
    with pytest.raises(ValueError, match=what):
        validate_source(bad, ["B", "S"])


def test_table_vectorised_matches_exact():
    table = ExprTable(["8*B*S + 4", "max(B, 4)*S", "7"], ["B", "S"])
    bs, ss = np.array([1, 3, 64]), np.array([5, 17, 2048])
    vec = table.evaluate({"B": bs, "S": ss})
    for k in range(3):
        assert list(vec[:, k]) == table.evaluate_exact({"B": int(bs[k]), "S": int(ss[k])})


def test_missing_size_is_named():
    with pytest.raises(ValueError, match="S"):
        ExprTable(["B*S"], ["B", "S"]).evaluate_exact({"B": 2})


def test_simplify_sum_expands():
    assert simplify_sum(["B*S", "3*B*S + 4"], ["B", "S"]) == "4*B*S + 4"


def test_ceil_of_true_division_becomes_integer_arithmetic():
    from torch.utils._sympy.functions import CeilToInt, FloorToInt, IntTrueDiv

    s = sympy.Symbol("s0", integer=True, positive=True)
    up = sympy_to_source(32 * CeilToInt(IntTrueDiv(s, 32)), {s: "S"})
    down = sympy_to_source(FloorToInt(IntTrueDiv(s, 32)), {s: "S"})
    table = ExprTable([up, down], ["S"])
    assert table.evaluate_exact({"S": 33}) == [64, 1]
    assert table.evaluate_exact({"S": 64}) == [64, 2]


@pytest.mark.parametrize("symbol", ["B=().__class__", "max", "1B", "lambda", ""])
def test_symbol_names_must_be_identifiers(symbol):
    with pytest.raises(ValueError, match="symbol name"):
        ExprTable(["1"], [symbol])


def test_powers_need_small_constant_exponents():
    validate_source("S**2", ["S"])
    for bad in ("B**B", "B**B**B", "B**17", "B**-1"):
        with pytest.raises(ValueError, match="exponent|disallowed"):
            validate_source(bad, ["B"])


def test_division_by_zero_and_overflow_are_value_errors():
    table = ExprTable(["B//(S - 3)", "B**3*S**3"], ["B", "S"])
    with pytest.raises(ValueError, match="divides by zero"):
        table.evaluate_exact({"B": 1, "S": 3})
    with pytest.raises(ValueError, match="cannot be evaluated"):
        table.evaluate({"B": 1, "S": 3})
    with pytest.raises(ValueError, match="beyond 2\\*\\*63"):
        table.evaluate({"B": 10**6, "S": 10**6})


def test_table_evaluates_with_more_than_64_symbols():
    symbols = [f"nz{k}" for k in range(80)]  # e.g. routing counts of many MoE experts
    table = ExprTable([" + ".join(symbols), "nz79 * 2"], symbols)
    sizes = {s: k for k, s in enumerate(symbols)}
    assert table.evaluate(sizes).tolist() == [sum(range(80)), 158]
    points = {s: np.array([k, k + 1]) for k, s in enumerate(symbols)}
    assert table.evaluate(points)[1].tolist() == [158, 160]


def test_constants_wider_than_64_bits_are_rejected():
    from memgnn.predictor.errors import UserError

    with pytest.raises(UserError, match="64 bits"):
        validate_source(f"B * {2**64}", ["B"])
    validate_source(f"B * {2**63 - 1}", ["B"])  # the widest int64 is fine


def test_no_silent_wrap_inside_a_formula_at_small_sizes():
    """(B * 2**62) // 2**62 is B; in int64 the product wraps to 0 at B = 4."""
    c = 2**62
    table = ExprTable([f"(B * {c}) // {c}", "B * 8"], ["B"])
    with pytest.raises(ValueError, match="overflow"):
        table.evaluate({"B": np.array([4])})
    assert table.evaluate_exact({"B": 4}) == [4, 32]  # exact evaluation is still right
    ok = ExprTable(["B * 8", "(S - 3) // 2"], ["B", "S"])
    assert ok.evaluate({"B": np.array([3, 2**20]), "S": np.array([9, 9])}).tolist() == [
        [24, 8 * 2**20],
        [3, 3],
    ]


def test_intermediate_overflow_at_large_sizes_is_an_error():
    table = ExprTable(["(B * 1099511627776) // 1099511627776"], ["B"])  # B * 2**40 / 2**40
    with pytest.raises(ValueError, match="overflow"):
        table.evaluate({"B": np.array([2**30])})

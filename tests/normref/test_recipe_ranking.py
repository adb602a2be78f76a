"""Inline questions 3.2, 3.3 and 3.4 of assignment 01: two-pass, Chan (tiles of 16)
and Welford ranked by their float32 error far from zero, why, and how the merge's
error and the naive one-pass formula's change with the tile size.

The ranking the judge expects must hold for every correct way of writing the
three methods in float32, so each is written here several ways (numpy and torch,
both algebraic forms of the merge, a tree of tiles) and measured against
float64's variance of the same float32 numbers.
"""

import numpy as np
import pytest
import torch

from normref.checks import CheckFailed, check_float32_ranking, check_one_read_cost, check_tile_sweep
from normref.checks import recipe_judges as judges


def _worst(variance, truth):
    return float(np.max(np.abs(np.asarray(variance, np.float64) - truth) / truth))


def _tile(part):
    mean = part.sum(-1) / part.shape[-1]
    return part.shape[-1], mean, ((part - mean[..., None]) ** 2).sum(-1)


def _merge_delta(a, b):
    n = a[0] + b[0]
    delta = b[1] - a[1]
    return n, a[1] + delta * (b[0] / n), a[2] + b[2] + delta * delta * (a[0] * b[0] / n)


def _merge_weighted(a, b):
    n = a[0] + b[0]
    mean = (a[0] * a[1] + b[0] * b[1]) / n
    return n, mean, a[2] + b[2] + a[0] * (a[1] - mean) ** 2 + b[0] * (b[1] - mean) ** 2


def _chan(x, tile, merge, tree=False):
    pieces = [_tile(x[..., s:s + tile]) for s in range(0, x.shape[-1], tile)]
    if tree:
        while len(pieces) > 1:
            pieces = [merge(*pieces[i:i + 2]) if i + 1 < len(pieces) else pieces[i]
                      for i in range(0, len(pieces), 2)]
        stats = pieces[0]
    else:
        stats = pieces[0]
        for piece in pieces[1:]:
            stats = merge(stats, piece)
    return stats[2] / stats[0]


def _welford(x, merge):
    stats = (1, x[..., 0], x[..., 0] * 0)
    for j in range(1, x.shape[-1]):
        stats = merge(stats, (1, x[..., j], x[..., j] * 0))
    return stats[2] / stats[0]


def test_the_expected_order_and_its_margins_in_the_reference():
    errors = judges.float32_worst_errors()
    assert errors["two-pass"] < 1e-5
    assert errors["chan"] > 30 * errors["two-pass"]
    assert errors["welford"] > 4 * errors["chan"]
    assert errors["welford"] < 1e-2  # inside the tests' 1% allowance


@pytest.mark.parametrize("library", ["numpy", "torch"])
@pytest.mark.parametrize("merge", [_merge_delta, _merge_weighted], ids=["delta", "weighted"])
@pytest.mark.parametrize("tree", [False, True], ids=["sequence", "tree"])
def test_every_correct_float32_implementation_ranks_the_same(library, merge, tree):
    x = judges.ranking_tokens()
    truth = np.var(x.astype(np.float64), axis=-1)
    if library == "torch":
        x = torch.from_numpy(x)
    two_pass = _tile(x)[2] / x.shape[-1]
    assert two_pass.dtype in (np.float32, torch.float32)
    errors = {"two-pass": _worst(two_pass, truth),
              "chan": _worst(_chan(x, 16, merge, tree), truth),
              "welford": _worst(_welford(x, merge), truth)}
    assert tuple(sorted(errors, key=errors.get)) == judges.RANKING_NAMES, errors
    assert errors["chan"] > 10 * errors["two-pass"] and errors["welford"] > 2 * errors["chan"]


def test_the_running_mean_is_the_cause():
    """Welford with only its running mean kept in float64 is as good as two-pass."""
    x = judges.ranking_tokens()
    truth = np.var(x.astype(np.float64), axis=-1)
    n, mean, m2 = 0, np.zeros(x.shape[0]), np.zeros(x.shape[0], np.float32)
    for feature in x.T:
        n += 1
        delta = feature - mean
        mean = mean + delta / n
        m2 = m2 + (delta * (feature - mean)).astype(np.float32)
    assert _worst(m2 / np.float32(n), truth) < 1e-5


@pytest.mark.parametrize("answer", [
    ["two-pass", "chan", "welford"], ("Two-Pass", "Chan", "Welford"),
    np.array(["two_pass", "chan", "welford"]), "two-pass < chan < welford",
    "two pass, chan, welford", ["2-pass", "chan", "welford"]])
def test_a_right_ranking_in_any_form_passes(answer, capsys):
    check_float32_ranking(answer)
    assert "all 1 cases passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer", [
    ["welford", "chan", "two-pass"], ["two-pass", "welford", "chan"],
    ["chan", "two-pass", "welford"], ["chan", "welford", "two-pass"]])
def test_a_wrong_ranking_fails_with_a_hint_that_keeps_the_answer(answer):
    with pytest.raises(CheckFailed) as failed:
        check_float32_ranking(answer)
    message = str(failed.value)
    hint = message.split("(you answered", 1)[-1]
    assert "float32" in hint
    for leak in ("running mean", "two-pass, chan", "most accurate", "round"):
        assert leak not in hint.split(")", 1)[-1], (answer, leak)


@pytest.mark.parametrize("answer", [None, 3, "", ["two-pass", "chan"],
                                    ["two-pass", "chan", "chan"], object()])
def test_a_malformed_ranking_is_named_not_crashed(answer):
    with pytest.raises(CheckFailed, match="name each of"):
        check_float32_ranking(answer)


def test_the_cost_question(capsys):
    for right in ("c", "C", "(c)", " c. "):
        check_one_read_cost(right)
    for wrong in ("a", "b", "d"):
        with pytest.raises(CheckFailed) as failed:
            check_one_read_cost(wrong)
        assert "running mean" not in str(failed.value)
    with pytest.raises(CheckFailed, match="give one of a, b, c, d"):
        check_one_read_cost("e")
    with pytest.raises(CheckFailed, match="give one of a, b, c, d"):
        check_one_read_cost(None)


def _released_cell_run(grade_id):
    """The namespace after running the release's cell `grade_id` (with numpy as np)."""
    import json

    from conftest import REPO

    cells = json.loads((REPO / "release" / "01_the_recipe" / "01_the_recipe.ipynb")
                       .read_text())["cells"]
    source = next("".join(c["source"]) for c in cells
                  if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
    namespace = {"np": np}
    exec(source, namespace)  # noqa: S102
    return namespace


def test_the_notebook_hands_out_the_judged_tokens():
    """The release's read-only cell makes the very tokens the expected order holds for."""
    namespace = _released_cell_run("ranking_tokens")
    np.testing.assert_array_equal(namespace["far_tokens"], judges.ranking_tokens())
    assert namespace["far_tokens"].dtype == np.float32


def _one_pass(x, tile):
    """Running sums of x and x**2, tile by tile, in x's own dtype."""
    total = squares = 0
    for start in range(0, x.shape[-1], tile):
        part = x[..., start:start + tile]
        total, squares = total + part.sum(-1), squares + (part * part).sum(-1)
    mean = total / x.shape[-1]
    return squares / x.shape[-1] - mean * mean


def _sweep(x, merge, truth):
    """{tile: (merge's worst error, one-pass's worst error)} over SWEEP_TILES."""
    return {tile: (_worst(_welford(x, merge) if tile == 1 else _chan(x, tile, merge), truth),
                   _worst(_one_pass(x, tile), truth))
            for tile in judges.SWEEP_TILES}


def _reads_as_choice_c(errors):
    """Choice (c) of inline question 3.4, and not (a), (b) or (d), read off a sweep."""
    tiles = judges.SWEEP_TILES
    merge = [errors[tile][0] for tile in tiles]
    assert max(merge) == merge[0] and min(merge) == merge[-1]  # worst at 1, best whole row
    assert merge[0] > 100 * merge[-1]  # not (a): the tile size matters
    steps = [a / b for a, b in zip(merge, merge[1:])]
    assert steps[-1] > 5 * max(steps[:-1])  # not (b): the first merge is the big step
    # tiles of 512 much closer to 64 than to the whole row, on a log scale
    assert np.log(errors[64][0] / errors[512][0]) < np.log(errors[512][0] / errors[1024][0]) / 5
    assert min(one_pass for _, one_pass in errors.values()) > 1  # not (d): >100% everywhere


def test_the_tile_sweep_reads_as_choice_c_in_the_reference():
    assert judges.SWEEP_TILES[-1] == judges.RANKING_SHAPE[-1]  # the last tile: the row
    _reads_as_choice_c(judges.tile_sweep_errors())


@pytest.mark.parametrize("library", ["numpy", "torch"])
@pytest.mark.parametrize("merge", [_merge_delta, _merge_weighted], ids=["delta", "weighted"])
def test_every_correct_float32_sweep_reads_as_choice_c(library, merge):
    """The judged answer holds for the merge written either way, summed by numpy or
    by torch, against float64's variance of the same float32 numbers."""
    x = judges.ranking_tokens()
    truth = np.var(x.astype(np.float64), axis=-1)
    if library == "torch":
        x = torch.from_numpy(x)
    assert _chan(x, 64, merge).dtype in (np.float32, torch.float32)
    _reads_as_choice_c(_sweep(x, merge, truth))


def test_the_sweep_question(capsys):
    for right in ("c", "C", "(c)", " c. ", np.str_("C.")):
        check_tile_sweep(right)
    for wrong in ("a", "b", "d"):
        with pytest.raises(CheckFailed) as failed:
            check_tile_sweep(wrong)
        hint = str(failed.value).split("(you answered", 1)[-1]
        assert "first merge" not in hint and "rounded" not in hint
    for malformed in ("e", None, ""):
        with pytest.raises(CheckFailed, match="give one of a, b, c, d"):
            check_tile_sweep(malformed)


def test_the_notebook_hands_out_the_judged_one_pass():
    """The release's read-only one_pass_var is the naive one-pass the sweep judges."""
    from normref import recipe

    namespace = _released_cell_run("sweep_one_pass")
    x = judges.ranking_tokens()
    for tile in judges.SWEEP_TILES:
        given = namespace["one_pass_var"](x, tile)
        assert given.dtype == np.float32
        np.testing.assert_array_equal(given, recipe.naive_chunked_var(x, tile))

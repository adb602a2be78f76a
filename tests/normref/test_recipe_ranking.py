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


def _welford_keeping(x, keep):
    """Welford in float32 with one of its numbers, "mean" or "m2", in float64."""
    mean = np.zeros(x.shape[0], np.float64 if keep == "mean" else np.float32)
    m2 = np.zeros(x.shape[0], np.float64 if keep == "m2" else np.float32)
    for n, feature in enumerate(x.T, start=1):
        delta = feature - mean
        mean = (mean + delta / n).astype(mean.dtype)
        m2 = (m2 + delta * (feature - mean)).astype(m2.dtype)
    return m2 / np.float32(x.shape[-1])


def _chan_means_in_float64(x, tile):
    """Chan left to right with every mean (each tile's, the running one) in float64
    and M2 summed and kept in float32."""
    def stats(part):
        mean = part.astype(np.float64).mean(-1)
        return part.shape[-1], mean, ((part - mean[..., None]) ** 2).astype(np.float32).sum(-1)

    merged = stats(x[..., :tile])
    for start in range(tile, x.shape[-1], tile):
        n, mean, m2 = _merge_delta(merged, stats(x[..., start:start + tile]))
        merged = n, mean, m2.astype(np.float32)
    return merged[2] / np.float32(merged[0])


def test_the_means_set_the_methods_apart_as_the_key_of_question_3_3_says():
    """Choice (c): with the means in float64 Welford and Chan (one merge or many)
    come within 1e-5 like two-pass; with M2 in float64 instead Welford stays as far
    off as in float32, so M2's rounding (b) is not it."""
    x = judges.ranking_tokens()
    truth = np.var(x.astype(np.float64), axis=-1)
    errors = judges.float32_worst_errors()
    assert _worst(_welford_keeping(x, "mean"), truth) < 1e-5
    assert _worst(_welford_keeping(x, "m2"), truth) > 0.5 * errors["welford"]
    in_float32 = {16: errors["chan"], 512: judges.tile_sweep_errors()[512][0]}
    for tile, error in in_float32.items():  # one merge or 63, all in float32: far off
        assert error > 1e-5 and _worst(_chan_means_in_float64(x, tile), truth) < 1e-5


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


def _reads_as_choice_d(errors):
    """Choice (d) of inline question 3.4, and not (a), (b) or (c), read off a sweep."""
    tiles = judges.SWEEP_TILES
    merge = [errors[tile][0] for tile in tiles]
    # shrinks as the tiles grow (not (a) or (c), which say it grows)
    assert all(a > b for a, b in zip(merge, merge[1:])) and merge[0] > 100 * merge[-1]
    steps = [a / b for a, b in zip(merge, merge[1:])]
    assert steps[-1] > 5 * max(steps[:-1])  # not (a) or (b): one step dwarfs the others
    # tiles of 512 much closer to 64 than to the whole row, on a log scale
    assert np.log(errors[64][0] / errors[512][0]) < np.log(errors[512][0] / errors[1024][0]) / 5
    # one-pass off by more than 100% at every tile size (not (b) or (c))
    assert min(one_pass for _, one_pass in errors.values()) > 1


def test_the_tile_sweep_reads_as_choice_d_in_the_reference():
    assert judges.SWEEP_TILES[-1] == judges.RANKING_SHAPE[-1]  # the last tile: the row
    _reads_as_choice_d(judges.tile_sweep_errors())


def _released_text(grade_id):
    import json

    from conftest import REPO

    cells = json.loads((REPO / "release" / "01_the_recipe" / "01_the_recipe.ipynb")
                       .read_text())["cells"]
    text = next("".join(c["source"]) for c in cells
                if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
    return " ".join(text.split())


def test_the_questions_after_3_2_do_not_give_its_order_away():
    """Question 3.4's options pair each direction of the merge's trend, each shape
    and each claim about one-pass with two letters, so the options alone cannot
    tell which of tiles of 1 (Welford) or the whole row (two-pass) is more
    accurate; question 3.3 asks which rounding sets the methods apart, not why
    reading once costs accuracy."""
    sweep = _released_text("sweep_question")
    options = sweep.split("Which describes your table?", 1)[1]
    for claim in ("error grows as the tiles grow", "error shrinks as the tiles grow",
                  "about the same factor at each step", "most of the change lies between",
                  "more than 100% at every tile size", "within 1% from tiles of 512 on"):
        assert options.count(claim) == 2, claim
    for leak in ("largest at tiles of 1", "smallest for the whole row"):
        assert leak not in options
    cost = _released_text("cost_question") + _released_text("cost_correct")
    for leak in ("pays for it", "explains the order", "each later merge builds on it",
                 "reading once costs"):
        assert leak not in cost


@pytest.mark.parametrize("library", ["numpy", "torch"])
@pytest.mark.parametrize("merge", [_merge_delta, _merge_weighted], ids=["delta", "weighted"])
def test_every_correct_float32_sweep_reads_as_choice_d(library, merge):
    """The judged answer holds for the merge written either way, summed by numpy or
    by torch, against float64's variance of the same float32 numbers."""
    x = judges.ranking_tokens()
    truth = np.var(x.astype(np.float64), axis=-1)
    if library == "torch":
        x = torch.from_numpy(x)
    assert _chan(x, 64, merge).dtype in (np.float32, torch.float32)
    _reads_as_choice_d(_sweep(x, merge, truth))


def test_the_sweep_question(capsys):
    for right in ("d", "D", "(d)", " d. ", np.str_("D.")):
        check_tile_sweep(right)
    for wrong in ("a", "b", "c"):
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

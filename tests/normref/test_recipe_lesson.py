"""Lesson 01's claims: its cells compute every number its text quotes; here each
number is checked against the text that quotes it, so that the lesson itself
keeps at most one teaching assert per cell. Runs the lesson's code in-process."""

import json
import os

import matplotlib
import numpy as np
import pytest
import torch

from conftest import REPO

LESSON = REPO / "notebooks" / "01_the_recipe_lesson.ipynb"


@pytest.fixture(scope="module")
def lesson():
    """(the namespace after every code cell ran, the text of every markdown cell)."""
    matplotlib.use("Agg")
    cells = json.loads(LESSON.read_text())["cells"]
    namespace = {"__name__": "lesson"}
    threads, here = torch.get_num_threads(), os.getcwd()
    os.chdir(LESSON.parent)  # the lesson reads data/digits.csv.gz from there
    try:
        for cell in cells:
            if cell["cell_type"] == "code":
                exec(compile("".join(cell["source"]), str(LESSON), "exec"),  # noqa: S102
                     namespace)
    finally:
        os.chdir(here)
        torch.set_num_threads(threads)  # the lesson sets one thread for its tiny tensors
    text = " ".join(" ".join("".join(c["source"]) for c in cells
                             if c["cell_type"] == "markdown").split())
    return namespace, text


def test_rows_and_columns_are_normalized_the_other_way_round(lesson):
    ns, _ = lesson
    by_rows, by_columns = ns["by_rows"], ns["by_columns"]
    assert np.allclose(by_rows.std(axis=1), 1, atol=1e-5)
    assert not np.allclose(by_rows.mean(axis=0), 0)
    assert np.allclose(by_columns.mean(axis=0), 0) and np.allclose(by_columns.std(axis=0), 1)
    assert not np.allclose(by_columns.mean(axis=1), 0)


def test_worked_examples_match_the_numbers_the_text_quotes(lesson):
    ns, text = lesson
    assert ns["mu_a"] == 5.0 and ns["var_a"] == 5.0
    assert np.array_equal(ns["deviations_a"], [-3.0, -1.0, 1.0, 3.0])
    assert round(ns["spread_a"], 3) == 2.236 and "spread $\\sqrt{5} \\approx 2.236$" in text
    # eps: equal to 5 decimals, different in the 6th ("Only the sixth decimal")
    assert np.array_equal(np.round(ns["x_hat_a"], 5), np.round(ns["x_hat_no_eps"], 5))
    assert not np.array_equal(np.round(ns["x_hat_a"], 6), np.round(ns["x_hat_no_eps"], 6))
    assert "Only the sixth decimal" in text
    assert ns["mu_z"] == 6.0 and ns["var_z"] == 14.0 and "Mean 6, variance 14" in text
    assert np.allclose(ns["y_from_paper"], [-1.1380, 1.0000, -0.0690, 4.2072])
    assert np.allclose(np.round(ns["y_z"], 4), [-1.1381, 1.0000, -0.0690, 4.2071])
    assert "`-1.1380` and `4.2072`" in text and "`-1.1381` and `4.2071`" in text
    assert ns["mean_two"] == 1.5 == ns["spread_two"] and np.allclose(ns["two"], [-1, 1], atol=1e-4)
    assert np.allclose(ns["a_affine"], [-1.683, 0.106, 1.894, 3.683], atol=5e-4)


def test_gamma_and_beta_set_the_output_mean_and_spread(lesson):
    ns, _ = lesson
    torch_ln, x_a = ns["torch_ln"], ns["x_a"]
    assert np.isclose(ns["shared"].mean(), -1.0)
    assert np.array_equal(torch_ln(x_a, gamma=0.0, beta=1.7), np.full(4, 1.7))
    assert np.allclose(torch_ln(x_a, gamma=-2.0), -2 * torch_ln(x_a))


def test_the_d_minus_1_default_is_as_the_text_says(lesson):
    """torch.var divides by d - 1 by default; np.var and F.layer_norm by d."""
    _, text = lesson
    x = torch.tensor([2.0, 4.0, 6.0, 8.0], dtype=torch.float64)
    assert np.isclose(x.var().item(), 20 / 3) and np.isclose(np.var(x.numpy()), 5.0)
    by_d = (x - x.mean()) / torch.sqrt(x.var(correction=0) + 1e-5)
    assert torch.allclose(torch.nn.functional.layer_norm(x, (4,)), by_d)
    assert "`torch.var` and `Tensor.std` divide by `d - 1` unless told `correction=0`" in text


def test_shifts_and_scales_as_the_text_says(lesson):
    ns, text = lesson
    torch_ln, x_a, sqrt_eps = ns["torch_ln"], ns["x_a"], ns["sqrt_eps"]
    assert round(ns["mean_and_spread"](ns["tens"])[1], 1) == 22.4 and "spread 22.4" in text
    assert 1e-7 < ns["gap_tens"] < 1e-5
    assert round(sqrt_eps, 3) == 0.003 and "far above 0.003" in text
    assert np.array_equal(ns["stored"], [0.0, 0.0, 8.0, 8.0])
    assert np.spacing(np.float32(1e8)) == 8.0 and "`1e8 + [0, 0, 8, 8]`" in text
    assert np.allclose(ns["ln_far_f32"], [0.0, 0.0, 1.414, 1.414], atol=1e-3)
    assert round(0.25 * ns["spread_a"], 2) == 0.56 and "about 0.56" in text
    assert round(0.001 * ns["spread_a"], 4) == 0.0022 and "the spread, 0.0022" in text
    assert np.allclose(ns["tiny"], [-0.775, -0.258, 0.258, 0.775], atol=5e-4)
    spreads, distances = ns["ks"] * ns["spread_a"], ns["distances"]
    assert distances[spreads > 100 * sqrt_eps].max() < 1e-4
    assert distances[spreads < sqrt_eps / 10].min() > 0.5
    assert np.allclose(torch_ln(-x_a), -torch_ln(x_a))
    assert np.array_equal(torch_ln(ns["flat"]), np.zeros(4))
    step_spread = ns["one_step"] * ns["spread_a"]
    assert round(step_spread, 2) == 0.11 and step_spread > 10 * sqrt_eps
    assert "(`k = 0.05`, spread 0.11)" in text


def test_the_eps_answers_quote_what_the_cells_compute(lesson):
    ns, text = lesson
    torch_ln, x_a, spread_of = ns["torch_ln"], ns["x_a"], ns["mean_and_spread"]
    # prompt (1): input spread 0.01 at eps 1e-3, against sigma / sqrt(sigma**2 + eps)
    assert np.isclose(ns["spread_at_001"], 0.01 / np.sqrt(0.01 ** 2 + 1e-3), rtol=1e-6)
    assert round(ns["spread_at_001"], 2) == 0.30 and "(1) About 0.30." in text
    # the measured bends (output spread 1/sqrt(2)) against the formula, sqrt(eps)
    assert np.isclose(ns["bend_default"], np.sqrt(1e-5), rtol=1e-6)
    assert np.isclose(ns["bend_bigger"], np.sqrt(1e-3), rtol=1e-6)
    assert round(ns["bend_default"], 3) == 0.003 and round(ns["bend_bigger"], 2) == 0.03
    assert "from about 0.003 to 0.03" in text
    assert spread_of(torch_ln(x_a, eps=1e-2))[1] > 0.999
    assert spread_of(torch_ln(0.25 * x_a, eps=1e-2))[1] > 0.98
    assert spread_of(torch_ln(0.001 * x_a, eps=1e-2))[1] < 0.03
    assert round(ns["spread_eps_one"], 2) == 0.91 and "about 0.91" in text
    assert round(ns["spread_near_out"], 2) == 0.33 and "About a third" in text


def test_batch_mates_as_the_text_says(lesson):
    ns, text = lesson
    assert np.array_equal(ns["ln_one"], ns["torch_ln"](ns["x_a"]))
    assert not np.allclose(ns["std_one"], ns["std_two"])


def test_the_digits_run_reads_as_the_answer_says(lesson):
    """Held-out accuracy on the digits: the claims of the folded answer, each
    against the arrays the cell computed."""
    ns, text = lesson
    plain, normed = ns["accuracy"][False], ns["accuracy"][True]
    assert plain.shape == normed.shape == (4, 15) and len(set(ns["starts"])) == 15
    assert {split for split, _ in ns["starts"]} == {0, 1, 2}
    assert np.all(np.isfinite(plain)) and np.all(np.isfinite(normed))
    gain = normed.mean(axis=1) - plain.mean(axis=1)
    assert np.all(gain >= 0.2) and "at each of the four rates, by 0.2 or more" in text
    assert normed.mean(axis=1).max() > plain.mean(axis=1).max()
    best = plain.mean(axis=1).argmax()
    assert 0 < best < 3  # "falls off on both sides"
    assert normed.mean(axis=1).min() > 0.6 and "stays above 0.6 at all four" in text
    assert np.all(normed.mean(axis=1) > 0.5)  # "names most digits right at every rate"
    assert "names most digits right at every rate" in text
    # the noise: single starts and splits, as "How far to trust the table" says
    assert 0.07 < plain.std(axis=1).mean() < 0.15 and "about 0.1 for the plain net" in text
    split_means = np.concatenate([a.reshape(4, 3, 5).mean(axis=2) for a in (plain, normed)])
    assert 0.05 < np.ptp(split_means, axis=1).max() < 0.15
    assert "as much as about 0.1 from one split to another" in text
    # single starts: a clear margin at the smallest rate only, as the answer says
    margin = normed.min(axis=1) - plain.max(axis=1)
    assert margin[0] > 0.1 and np.all(margin[1:] < 0.1)
    assert "only at the smallest rate does even the worst start" in text
    assert "come within 0.1 of each other or overlap" in text
    # the means: each gain more than four standard errors of the paired differences
    paired = normed - plain
    error = paired.std(axis=1, ddof=1) / np.sqrt(15)
    assert np.all(error < 0.1) and "a few hundredths" in text
    assert np.all(gain > 4 * error) and "every gain above is more than four of them" in text
    np.testing.assert_allclose(ns["standard_error"], error, rtol=1e-6)


def test_the_digits_readings_print_no_float32_noise(lesson, capsys):
    """The readings cell rounds what it prints: no float32 tails such as
    0.28999999165534973 in the per-split means."""
    ns, _ = lesson
    cells = json.loads(LESSON.read_text())["cells"]
    readings = next("".join(c["source"]) for c in cells
                    if "".join(c["source"]).startswith("# The readings behind the answer."))
    exec(compile(readings, str(LESSON), "exec"), dict(ns))  # noqa: S102
    printed = capsys.readouterr().out
    assert "each split's mean of 5 starts" in printed
    numbers = [n for n in printed.replace("[", " ").replace("]", " ").replace(";", " ")
               .replace(",", " ").split() if n.replace(".", "", 1).lstrip("+-").isdigit()]
    assert numbers and max(len(n.split(".")[-1]) for n in numbers if "." in n) <= 3


def test_eps_outside_the_root_differs_only_for_small_spreads(lesson):
    """(x - mean) / (std + eps) against PyTorch's layer norm, as the lesson's table
    says: agreement to the fifth decimal for ordinary tokens, a wide gap at spread
    0.002, 0 for a constant token, and the bend near spread = eps."""
    ns, text = lesson
    x_a, eps = ns["x_a"], 1e-5
    # independent of the lesson's helpers: the two forms written out here
    def inside(x):
        return (x - x.mean()) / np.sqrt(x.var() + eps)

    def outside(x):
        return (x - x.mean()) / (x.std() + eps)

    for k in (10.0, 1.0):
        assert np.abs(inside(k * x_a) - outside(k * x_a)).max() < 1e-5
    small = 0.001 * x_a
    assert round(inside(small).std(), 2) == 0.58 and outside(small).std() > 0.99
    assert "keeps about 0.58 of the output spread" in text
    assert np.array_equal(outside(np.zeros(4)), np.zeros(4))
    at_eps = eps / ns["spread_a"] * x_a  # input spread eps
    assert np.isclose(outside(at_eps).std(), 0.5) and inside(at_eps).std() < 0.01
    assert "near spread = `eps` itself (1e-5)" in text
    assert "Annotated Transformer (Rush, 2018)" in text
    for spread, (ins, out, _gap) in ns["placements"].items():
        k = spread / ns["spread_a"]
        assert np.isclose(ins, inside(k * x_a).std(), atol=1e-9)
        assert np.isclose(out, outside(k * x_a).std(), atol=1e-9)


def test_the_digits_baseline_and_split(lesson):
    """The dotted line is the held-out share of the training set's commonest
    digit; the split is 500 and 1,297 of the 1,797 images, as the text says."""
    ns, text = lesson
    labels = ns["digit_labels"]
    assert len(labels) == 1797 and ns["pixels"].shape == (1797, 64)
    assert len(ns["train_rows"]) == 500 and len(ns["held_out_rows"]) == 1297
    assert not set(ns["train_rows"]) & set(ns["held_out_rows"])
    counts = np.bincount(labels[ns["train_rows"]], minlength=10)
    assert counts[ns["most_common"]] == counts.max()
    assert np.isclose(ns["baseline"],
                      np.mean(labels[ns["held_out_rows"]] == ns["most_common"]))
    assert "500 for training and the other 1,297 held out" in text
    drawn = {line.get_label(): line.get_ydata() for line in ns["ax"].lines}
    assert np.allclose(drawn["always the commonest digit"], ns["baseline"])


def test_check_yourself_answers_quote_what_the_cell_computes(lesson):
    ns, text = lesson
    assert ns["mu_q1"] == 2.0 and np.isclose(ns["spread_q1"] ** 2, 2 / 3)
    assert round(ns["spread_q1"], 4) == 0.8165 and "spread about 0.8165" in text
    assert np.allclose(ns["q1"], [-1.2247, 0.0, 1.2247], atol=5e-5)
    assert round(ns["spread_q3"], 6) == 0.000112 and round(ns["out_spread_q3"], 3) == 0.035
    assert "about 0.000112" in text and "only about 0.035" in text
    assert np.array_equal(ns["q4"], ns["beta_q4"]) and np.all(np.isnan(ns["q4_no_eps"]))
    assert ns["n_params"] == 2 * ns["d_model"] == 1024 and "(5) 1024" in text

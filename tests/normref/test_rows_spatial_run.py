"""Unit 02, Exercise 11: the run of the three norms on frozen conv features of the
digits. Its graded answers are facts that must hold for every correct implementation
and every seed: run the notebook's own experiment code with the course's references
(numpy, float64) and with a torch float32 version, over several seeds of the frozen
convolution and of the head, and check each fact the judges grade."""

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from normref import batchnorm
from normref.checks._runner import answer_text
from normref.checks.rows_judges import (
    _LOSES_AT_BATCH_2,
    _ONE_IMAGE_WORKS,
    EVAL_MODE_ACCURACY,
    EVAL_MODE_TOLERANCE,
    RUN_FUNCTIONS,
    _judge_batch_of_one_answer,
    _judge_eval_mode_accuracy,
    _judge_spatial_run_losses,
    _judge_spatial_run_values,
    run_values_per_statistic,
)

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "source" / "02_rows_versus_columns" / "02_rows_versus_columns.ipynb"


def _cell_code(grade_id):
    cells = json.loads(SOURCE.read_text())["cells"]
    (cell,) = [c for c in cells if c.get("metadata", {}).get("nbgrader", {}).get(
        "grade_id") == grade_id]
    return "".join(cell["source"])


def _experiment_code():
    code = _cell_code("spatial_run_experiment")
    # the definitions only: the run itself is repeated here, seed by seed
    return code[:code.index("pixels, digit_labels = load_digits_table()")]


def _torch_float32_norms():
    """Correct code written another way: torch, float32, statistics via reshapes."""
    def spatial(x, gamma, beta, eps=1e-5):
        t = torch.as_tensor(x, dtype=torch.float32).transpose(0, 1).reshape(x.shape[1], -1)
        y = (t - t.mean(1, keepdim=True)) / torch.sqrt(t.var(1, unbiased=False,
                                                              keepdim=True) + eps)
        return y.reshape(x.shape[1], x.shape[0], *x.shape[2:]).transpose(0, 1)

    def train(x, gamma, beta, running_mean, running_var, momentum, convention="pytorch",
              eps=1e-5):
        t = torch.as_tensor(x, dtype=torch.float32)
        mean, var = t.mean(0), t.var(0, unbiased=False)
        n = t.shape[0]
        return ((t - mean) / torch.sqrt(var + eps),
                (1 - momentum) * torch.as_tensor(running_mean) + momentum * mean,
                (1 - momentum) * torch.as_tensor(running_var) + momentum * var * n / (n - 1))

    def evaluate(x, gamma, beta, running_mean, running_var, eps=1e-5):
        t = torch.as_tensor(x, dtype=torch.float32)
        return (t - running_mean) / torch.sqrt(running_var + eps)

    def group(x, num_groups, gamma, beta, eps=1e-5):
        t = torch.as_tensor(x, dtype=torch.float32)
        g = t.reshape(t.shape[0], num_groups, -1)
        y = (g - g.mean(-1, keepdim=True)) / torch.sqrt(
            g.var(-1, unbiased=False, keepdim=True) + eps)
        return y.reshape(t.shape)

    return {"spatial_batch_norm_forward": spatial, "batch_norm_train": train,
            "group_norm": group, "batch_norm_eval": evaluate}


def _namespace(functions):
    space = {"np": np, "time": __import__("time"), **functions}
    exec(compile(_experiment_code(), "spatial_run_experiment", "exec"), space)
    return space


@pytest.fixture(scope="module")
def digits():
    rows = np.loadtxt(REPO / "notebooks" / "data" / "digits.csv.gz", delimiter=",")
    return rows[:, :-1], rows[:, -1].astype(int)


REFERENCE = {"spatial_batch_norm_forward": batchnorm.spatial_batch_norm_forward,
             "batch_norm_train": batchnorm.batch_norm_train,
             "group_norm": batchnorm.group_norm,
             "batch_norm_eval": batchnorm.batch_norm_eval}


@pytest.mark.parametrize("functions, seeds", [
    (REFERENCE, (0, 1, 2, 3)),
    (_torch_float32_norms(), (4,)),
], ids=["float64 references", "torch float32"])
def test_the_graded_facts_hold_for_every_seed(digits, functions, seeds):
    space = _namespace(functions)
    pixels, labels = digits
    for seed in seeds:
        features = space["frozen_conv"](pixels, seed=seed)
        change = {}
        for name in RUN_FUNCTIONS:
            accuracy = {size: space["run"](space["RUN_NORMS"][name], size, features, labels,
                                           seed=seed) for size in (32, 2)}
            change[name] = 100 * (accuracy[2] - accuracy[32])
            assert accuracy[32] > 0.9, (seed, name, accuracy)
        lost = {name for name, points in change.items() if points < -5}
        assert lost == _LOSES_AT_BATCH_2, (seed, change)
        # and with room to spare: no norm near the 5-point line
        assert change["batch_norm_train"] < -10, (seed, change)
        assert abs(change["spatial_batch_norm_forward"]) < 2.5, (seed, change)
        assert abs(change["group_norm"]) < 0.3, (seed, change)  # under one image


def test_the_counts_are_what_the_norms_average_over():
    x = np.random.default_rng(0).normal(size=(2, 16, 6, 6))
    counts = run_values_per_statistic(2)
    # nudge one value and count the outputs that move in its channel/feature/group
    nudged = x.copy()
    nudged[0, 0, 0, 0] += 1.0
    ones, zeros = np.ones(16), np.zeros(16)

    def moved_of(a, b):
        return (~np.isclose(a, b, rtol=0, atol=1e-12)).sum()

    assert moved_of(batchnorm.spatial_batch_norm_forward(x, ones, zeros),
                    batchnorm.spatial_batch_norm_forward(nudged, ones, zeros)
                    ) == counts["spatial_batch_norm_forward"]
    assert moved_of(batchnorm.group_norm(x, 4, ones, zeros),
                    batchnorm.group_norm(nudged, 4, ones, zeros)) == counts["group_norm"]
    flat = batchnorm.batch_norm_train(x.reshape(2, -1), np.ones(576), np.zeros(576),
                                      np.zeros(576), np.ones(576), 0.1)[0]
    flat_nudged = batchnorm.batch_norm_train(nudged.reshape(2, -1), np.ones(576),
                                             np.zeros(576), np.zeros(576),
                                             np.ones(576), 0.1)[0]
    assert moved_of(flat, flat_nudged) == counts["batch_norm_train"]
    # one image: batch_norm_train raises, the other two still divide by a spread
    with pytest.raises(ValueError):
        batchnorm.batch_norm_train(x[:1].reshape(1, -1), np.ones(576), np.zeros(576),
                                   np.zeros(576), np.ones(576), 0.1)
    assert _ONE_IMAGE_WORKS == {"spatial_batch_norm_forward", "group_norm"}


@pytest.mark.parametrize("answers, right", [
    ({"spatial_bn_values": 72, "position_bn_values": 2, "group_norm_values": 144}, True),
    ({"spatial_bn_values": np.int64(72), "position_bn_values": 2.0,
      "group_norm_values": torch.tensor(144)}, True),
    ({"spatial_bn_values": 2, "position_bn_values": 2, "group_norm_values": 144}, False),
    ({"spatial_bn_values": 72, "position_bn_values": 72, "group_norm_values": 144}, False),
    ({"spatial_bn_values": 72, "position_bn_values": 2, "group_norm_values": 288}, False),
    ({"spatial_bn_values": 72, "position_bn_values": 2, "group_norm_values": None}, False),
])
def test_values_judge(answers, right):
    output = {k: np.array(str(v)) for k, v in answers.items()}
    verdict = _judge_spatial_run_values({}, output)
    assert (verdict is None) == right, verdict


@pytest.mark.parametrize("names, right", [
    (["batch_norm_train"], True),
    (("Batch_Norm_Train ",), True),
    ([], False),
    (["batch_norm_train", "spatial_batch_norm_forward"], False),
    (["batch_norm_train", "group_norm"], False),
    (["layer_norm"], False),
])
def test_losses_judge(names, right):
    verdict = _judge_spatial_run_losses({}, {"names": np.array(names, dtype=str)})
    assert (verdict is None) == right, verdict


def test_losses_judge_names_the_n_only_slip():
    verdict = _judge_spatial_run_losses({}, {"names": np.array(
        ["batch_norm_train", "spatial_batch_norm_forward"])})
    assert "over the images alone" in verdict


@pytest.mark.parametrize("names, right", [
    (["spatial_batch_norm_forward", "group_norm"], True),
    ({"GROUP_NORM", "spatial_batch_norm_forward"}, True),
    (["group_norm"], False),
    (["spatial_batch_norm_forward", "group_norm", "batch_norm_train"], False),
])
def test_batch_of_one_judge(names, right):
    verdict = _judge_batch_of_one_answer({}, {"names": np.array(sorted(names), dtype=str)})
    assert (verdict is None) == right, verdict


def _eval_mode_accuracy(space, features, labels, seed, momentum=0.1):
    """Question 4 written apart from the solution cell: the batch-2 pass of
    batch_norm_train carrying its running statistics, the held-out images through
    batch_norm_eval with them."""
    order = np.random.default_rng(20).permutation(len(labels))
    held_out, train_rows = order[:360], order[360:]
    train_rows = train_rows[np.random.default_rng(seed).permutation(len(train_rows))][:1408]
    flat = features.reshape(len(features), -1)
    width = flat.shape[1]
    mean, var = np.zeros(width), np.ones(width)
    table = []
    for start in range(0, len(train_rows), 2):
        y, mean, var = space["batch_norm_train"](flat[train_rows[start:start + 2]],
                                                 np.ones(width), np.zeros(width), mean, var,
                                                 momentum)
        table.append(np.maximum(space["as_array"](y), 0))
    weight, bias = space["train_head"](np.concatenate(table), labels[train_rows], seed)
    scored = np.maximum(space["as_array"](space["batch_norm_eval"](
        flat[held_out], np.ones(width), np.zeros(width), mean, var, 1e-5)), 0)
    return ((scored @ weight + bias).argmax(axis=1) == labels[held_out]).mean()


@pytest.mark.parametrize("functions, seeds", [
    (REFERENCE, [(conv, head) for conv in range(4) for head in range(3)]),
    (_torch_float32_norms(), [(4, 0), (5, 1)]),
], ids=["float64 references, 12 seeds", "torch float32"])
def test_eval_mode_accuracy_holds_for_every_seed(digits, functions, seeds):
    space = _namespace(functions)
    pixels, labels = digits
    for conv_seed, head_seed in seeds:
        features = space["frozen_conv"](pixels, seed=conv_seed)
        accuracy = _eval_mode_accuracy(space, features, labels, head_seed)
        assert abs(accuracy - EVAL_MODE_ACCURACY) <= EVAL_MODE_TOLERANCE - 0.005, (
            conv_seed, head_seed, accuracy)
        # the pairs-in-training-mode figure it is compared with is far below
        paired = space["run"](space["RUN_NORMS"]["batch_norm_train"], 2, features, labels,
                              seed=head_seed)
        assert accuracy - paired > 0.1, (conv_seed, head_seed, accuracy, paired)


def test_eval_mode_slips_fall_outside(digits):
    space = _namespace(REFERENCE)
    pixels, labels = digits
    features = space["frozen_conv"](pixels, seed=0)
    for momentum in (0.0, 0.9):  # never updated; 0.9 on the new batch
        accuracy = _eval_mode_accuracy(space, features, labels, 0, momentum=momentum)
        assert _judge_eval_mode_accuracy({}, {"eval_mode_accuracy": np.array(
            repr(accuracy))}) is not None, (momentum, accuracy)


def test_the_solution_cell_gives_an_accepted_answer(digits):
    space = _namespace(REFERENCE)
    pixels, space["digit_labels"] = digits
    space["conv_features"] = space["frozen_conv"](pixels)
    space["pixels"] = pixels
    space["print"] = lambda *args, **kwargs: None
    exec(compile(_cell_code("eval_mode_run"), "eval_mode_run", "exec"), space)
    measured = space["accuracy"]
    assert _judge_eval_mode_accuracy({}, {"eval_mode_accuracy": np.array(repr(measured))}) is None
    # the answer cell writes down what the run printed
    exec(compile(_cell_code("eval_mode_answer_cell"), "eval_mode_answer_cell", "exec"), space)
    assert abs(space["EVAL_MODE_ACCURACY"] - measured) < 1e-4


@pytest.mark.parametrize("answer, right", [
    (0.9472, True), (np.float64(0.9472), True), (torch.tensor(0.9472, dtype=torch.float64), True),
    (Fraction(341, 360), True), (94.72, True), (0.7528, False), (0.97, False), (0.89, False),
    ("0.95a", False),
])
def test_eval_mode_judge(answer, right):
    verdict = _judge_eval_mode_accuracy({}, {"eval_mode_accuracy": np.array(
        answer_text(answer))})
    assert (verdict is None) == right, verdict

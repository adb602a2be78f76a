"""Unit 02, Exercise 11: the run of the three norms on frozen conv features of the
digits. The run's outcome (batch_norm_train alone loses over 5 points at batch 2), which
the questions' text relies on, must hold for every correct implementation and every
seed; question 1's counting rule is checked by nudging one input of the references;
question 2 asks for figures of the run with its seeds fixed, which every correct
implementation must reproduce within the judge's tolerance, and the ungraded runs at
batch 8 and 4 and with 1 and 16 groups must show what their folded answers say. Each is
checked by running the notebook's own experiment code with the course's references
(numpy, float64) and with a torch float32 version."""

import json
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from check_calls import fails, passes

from normref import batchnorm
from normref.checks import check_statistic_sizes_answer
from normref.checks._runner import answer_text
from normref.checks.rows_judges import (
    BN_TRAIN_ACCURACY,
    EVAL_MODE_ACCURACY,
    EVAL_MODE_FEATURE_MEAN,
    GROUP_NORM_ACCURACY,
    RUN_HELD_OUT,
    RUN_TOLERANCE,
    _judge_eval_mode_accuracy,
    values_per_statistic,
)

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "source" / "02_rows_versus_columns" / "02_rows_versus_columns.ipynb"
RUN_FUNCTIONS = ("spatial_batch_norm_forward", "batch_norm_train", "group_norm")
LOSES_AT_BATCH_2 = {"batch_norm_train"}  # what question 2's text says of the run


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
        assert lost == LOSES_AT_BATCH_2, (seed, change)
        # and with room to spare: no norm near the 5-point line
        assert change["batch_norm_train"] < -10, (seed, change)
        assert abs(change["spatial_batch_norm_forward"]) < 2.5, (seed, change)
        assert abs(change["group_norm"]) < 0.3, (seed, change)  # under one image


def _outputs_sharing_a_statistic(norm, shape=(2, 16, 6, 6)):
    """How many outputs of norm move when one input value moves: the values its
    statistic is taken over, counted without the judge's arithmetic."""
    x = np.random.default_rng(3).normal(size=shape)
    nudged = x.copy()
    nudged[0, 0, 0, 0] += 1.0
    return int((~np.isclose(norm(x), norm(nudged), rtol=0, atol=1e-12)).sum())


def test_the_counting_rule_of_question_1_is_what_a_nudge_moves():
    """The rule, checked by nudging on the run's own features (2, 16, 6, 6) with 4
    groups, then applied to the question's (2, 128, 1024, 2048) with 32 groups."""
    ones, zeros = np.ones(16 * 36), np.zeros(16 * 36)
    moved = {
        "flat_bn_values_at_2": _outputs_sharing_a_statistic(lambda f: batchnorm.batch_norm_train(
            f.reshape(len(f), -1), ones, zeros, zeros, ones, 0.1)[0]),
        "spatial_bn_values_at_2": _outputs_sharing_a_statistic(
            lambda f: batchnorm.spatial_batch_norm_forward(f, ones[:16], zeros[:16])),
        "group_norm_values_at_2": _outputs_sharing_a_statistic(
            lambda f: batchnorm.group_norm(f, 4)),
    }
    assert moved == values_per_statistic(batch=2, channels=16, positions=36, groups=4)
    assert values_per_statistic() == {"flat_bn_values_at_2": 2,
                                      "spatial_bn_values_at_2": 2 * 1024 * 2048,
                                      "group_norm_values_at_2": 4 * 1024 * 2048}


@pytest.mark.parametrize("answers", [
    {"flat_bn_values_at_2": 2, "spatial_bn_values_at_2": 4194304,
     "group_norm_values_at_2": 8388608},
    {"flat_bn_values_at_2": np.int64(2), "spatial_bn_values_at_2": 4194304.0,
     "group_norm_values_at_2": Fraction(8388608)},
    {"flat_bn_values_at_2": torch.tensor(2), "spatial_bn_values_at_2": np.float32(4194304),
     "group_norm_values_at_2": np.array(8388608)},
])
def test_statistic_sizes_accept_any_numeric_type(answers):
    assert "passed" in passes(lambda a: check_statistic_sizes_answer(**a), answers)


SPATIAL, GROUPED, POSITIONS = 4194304, 8388608, 1024 * 2048


@pytest.mark.parametrize("answers, said", [
    ((2, 2, GROUPED), "over the images AND their"),
    ((2, POSITIONS, GROUPED), "in every image of the batch"),
    ((2, SPATIAL, 4), "at every one of the"),
    ((2, SPATIAL, 2 * GROUPED), "never crosses from one image to another"),
    ((2, SPATIAL, 32 * POSITIONS), "each holds C / G = 4 channels"),
    ((2, SPATIAL, 128 * POSITIONS), "not one group of all 128"),
    ((2 * 128 * POSITIONS, SPATIAL, GROUPED), "one mean per column"),
    ((3, SPATIAL, GROUPED), "which axes does this norm average over"),
    ((None, SPATIAL, GROUPED), "is not a number"),
])
def test_each_statistic_size_slip_is_named(answers, said):
    names = ("flat_bn_values_at_2", "spatial_bn_values_at_2", "group_norm_values_at_2")
    message = fails(lambda a: check_statistic_sizes_answer(**dict(zip(names, a))), answers)
    assert said in message, message


def _eval_mode_accuracy(space, features, labels, seed, momentum=0.1):
    """Question 2's accuracy (see _eval_mode_figures)."""
    return _eval_mode_figures(space, features, labels, seed, momentum)[0]


def _eval_mode_figures(space, features, labels, seed, momentum=0.1, convention="pytorch",
                       held_out="running statistics"):
    """Question 2 written apart from the solution cell: the batch-2 pass of
    batch_norm_train carrying its running statistics, the held-out images through
    batch_norm_eval with them -> (accuracy, feature 21's mean before the ReLU).
    held_out names how the held-out images are normalized: "running statistics"
    (as asked), "training statistics" (the training images' own mean and variance)
    or "one training batch" (all 360 in training mode)."""
    order = np.random.default_rng(20).permutation(len(labels))
    held_rows, train_rows = order[:360], order[360:]
    train_rows = train_rows[np.random.default_rng(seed).permutation(len(train_rows))][:1408]
    flat = features.reshape(len(features), -1)
    width = flat.shape[1]
    mean, var = np.zeros(width), np.ones(width)
    table = []
    for start in range(0, len(train_rows), 2):
        y, mean, var = space["batch_norm_train"](flat[train_rows[start:start + 2]],
                                                 np.ones(width), np.zeros(width), mean, var,
                                                 momentum, convention)
        table.append(np.maximum(space["as_array"](y), 0))
    weight, bias = space["train_head"](np.concatenate(table), labels[train_rows], seed)
    if held_out == "training statistics":
        mean, var = flat[train_rows].mean(axis=0), flat[train_rows].var(axis=0)
    if held_out == "one training batch":
        normalized = space["as_array"](space["batch_norm_train"](
            flat[held_rows], np.ones(width), np.zeros(width), mean, var, momentum)[0])
    else:
        normalized = space["as_array"](space["batch_norm_eval"](
            flat[held_rows], np.ones(width), np.zeros(width), mean, var, 1e-5))
    scored = np.maximum(normalized, 0)
    accuracy = ((scored @ weight + bias).argmax(axis=1) == labels[held_rows]).mean()
    return accuracy, normalized[:, 21].mean()


def _group_norm_of(functions, groups):
    return lambda f: functions["group_norm"](f, groups, np.ones(16), np.zeros(16), 1e-5)


def _fixed_seed_figures(functions, digits):
    """The run's figures (question 2's, and the lines of the ungraded runs), from
    the run with its seeds fixed (0), as counts of held-out images."""
    space = _namespace(functions)
    pixels, labels = digits
    features = space["frozen_conv"](pixels)
    figures = {("batch_norm_train", size): space["run"](
        space["RUN_NORMS"]["batch_norm_train"], size, features, labels) for size in (32, 8, 4, 2)}
    figures.update({("group_norm", groups): space["run"](
        _group_norm_of(functions, groups), 2, features, labels) for groups in (1, 4, 16)})
    figures["eval mode"] = _eval_mode_accuracy(space, features, labels, 0)
    return figures


@pytest.mark.parametrize("functions", [REFERENCE, _torch_float32_norms()],
                         ids=["float64 references", "torch float32"])
def test_the_judged_figures_are_what_the_fixed_seed_run_gives(digits, functions):
    figures = _fixed_seed_figures(functions, digits)
    judged = {**{("batch_norm_train", size): BN_TRAIN_ACCURACY[size] for size in (32, 8, 4, 2)},
              **{("group_norm", groups): GROUP_NORM_ACCURACY[groups] for groups in (1, 4, 16)},
              "eval mode": EVAL_MODE_ACCURACY}
    for key, figure in judged.items():
        # within half an image: the same count of held-out images, in either precision
        assert abs(figures[key] - float(figure)) < 0.5 / RUN_HELD_OUT, (key, figures[key])


def test_the_run_lines_a_student_may_copy_by_mistake_fall_outside_the_tolerance():
    # question 2: the training-mode batch-2 and the batch-32 lines
    for line in (BN_TRAIN_ACCURACY[2], BN_TRAIN_ACCURACY[32]):
        assert abs(EVAL_MODE_ACCURACY - line) > RUN_TOLERANCE, line


def test_small_batches_lose_step_by_step_for_every_seed(digits):
    """The batch-8 and batch-4 run's lesson: scored in training mode, batch_norm_train
    loses more at each smaller batch, not all at once at 2."""
    space = _namespace(REFERENCE)
    pixels, labels = digits
    for seed in range(4):
        features = space["frozen_conv"](pixels, seed=seed)
        accuracy = [space["run"](space["RUN_NORMS"]["batch_norm_train"], size, features,
                                 labels, seed=seed) for size in (32, 8, 4, 2)]
        steps = -np.diff(accuracy)  # 32 -> 8, 8 -> 4, 4 -> 2
        assert (steps > 0.02).all(), (seed, accuracy)


def test_the_number_of_groups_moves_accuracy_little_for_every_seed(digits):
    """The group-count run's lesson: 1, 4 or 16 groups land within a couple of points of one
    another, far less than batch_norm_train's loss at batch 2."""
    space = _namespace(REFERENCE)
    pixels, labels = digits
    for seed in range(4):
        features = space["frozen_conv"](pixels, seed=seed)
        grouped = [space["run"](_group_norm_of(REFERENCE, groups), 2, features, labels,
                                seed=seed) for groups in (1, 4, 16)]
        bn_loss = (space["run"](space["RUN_NORMS"]["batch_norm_train"], 32, features, labels,
                                seed=seed)
                   - space["run"](space["RUN_NORMS"]["batch_norm_train"], 2, features,
                                  labels, seed=seed))
        assert max(grouped) - min(grouped) < 0.025, (seed, grouped)
        assert max(grouped) - min(grouped) < bn_loss / 5, (seed, grouped, bn_loss)


def test_eval_mode_wins_back_most_of_the_batch_2_loss_for_every_seed(digits):
    """Question 2's lesson, over 12 seeds of the convolution and the head: scored in eval
    mode, the batch-2 run recovers most of what the pairs lost against batch 32."""
    space = _namespace(REFERENCE)
    pixels, labels = digits
    for conv_seed in range(4):
        features = space["frozen_conv"](pixels, seed=conv_seed)
        for head_seed in range(3):
            accuracy = _eval_mode_accuracy(space, features, labels, head_seed)
            run = {size: space["run"](space["RUN_NORMS"]["batch_norm_train"], size,
                                      features, labels, seed=head_seed) for size in (32, 2)}
            recovered = (accuracy - run[2]) / (run[32] - run[2])
            assert recovered > 0.7, (conv_seed, head_seed, accuracy, run)


def test_eval_mode_slips_fall_outside(digits):
    space = _namespace(REFERENCE)
    pixels, labels = digits
    features = space["frozen_conv"](pixels, seed=0)
    for momentum in (0.0, 0.9):  # never updated; 0.9 on the new batch
        accuracy = _eval_mode_accuracy(space, features, labels, 0, momentum=momentum)
        assert _judge_eval_mode_accuracy({}, {"eval_mode_accuracy": np.array(
            repr(accuracy))}) is not None, (momentum, accuracy)


@pytest.mark.parametrize("functions", [REFERENCE, _torch_float32_norms()],
                         ids=["float64 references", "torch float32"])
def test_the_judged_feature_mean_is_what_the_fixed_seed_run_gives(digits, functions):
    space = _namespace(functions)
    pixels, labels = digits
    accuracy, mean = _eval_mode_figures(space, space["frozen_conv"](pixels), labels, 0)
    assert abs(mean - EVAL_MODE_FEATURE_MEAN) < 1e-4, mean
    assert _judge_eval_mode_accuracy({}, {"eval_mode_accuracy": np.array(repr(accuracy)),
                                          "eval_mode_feature_21_mean": np.array(
                                              repr(mean))}) is None


@pytest.mark.parametrize("procedure, said", [
    (dict(held_out="one training batch"), "a training-mode batch of the 360"),
    (dict(held_out="training statistics"), "the training images' own mean and variance"),
    (dict(convention="cs231n", momentum=0.9), "CS231n's convention"),
])
def test_wrong_eval_procedures_that_keep_the_accuracy_lose_the_point_on_the_mean(
        digits, procedure, said):
    """The accuracy alone cannot tell these procedures from the right one (the text
    says so); feature 21's mean does, and names the procedure."""
    space = _namespace(REFERENCE)
    pixels, labels = digits
    accuracy, mean = _eval_mode_figures(space, space["frozen_conv"](pixels), labels, 0,
                                        **procedure)
    assert abs(accuracy - float(EVAL_MODE_ACCURACY)) <= 1 / RUN_HELD_OUT + 1e-9, accuracy
    verdict = _judge_eval_mode_accuracy({}, {
        "eval_mode_accuracy": np.array(repr(accuracy)),
        "eval_mode_feature_21_mean": np.array(repr(mean))})
    assert verdict is not None and verdict.startswith("EVAL_MODE_FEATURE_21_MEAN"), verdict
    assert said in verdict, verdict


def test_the_solution_cell_gives_an_accepted_answer(digits):
    space = _namespace(REFERENCE)
    pixels, space["digit_labels"] = digits
    space["conv_features"] = space["frozen_conv"](pixels)
    space["pixels"] = pixels
    space["print"] = lambda *args, **kwargs: None
    exec(compile(_cell_code("eval_mode_run"), "eval_mode_run", "exec"), space)
    measured = space["accuracy"]
    mean = space["eval_outputs"][:, 21].mean()
    assert _judge_eval_mode_accuracy({}, {"eval_mode_accuracy": np.array(repr(measured)),
                                          "eval_mode_feature_21_mean": np.array(
                                              repr(mean))}) is None
    # the answer cell writes down what the run printed
    exec(compile(_cell_code("eval_mode_answer_cell"), "eval_mode_answer_cell", "exec"), space)
    assert abs(space["EVAL_MODE_ACCURACY"] - measured) < 1e-4
    assert abs(space["EVAL_MODE_FEATURE_21_MEAN"] - mean) < 1e-4


@pytest.mark.parametrize("answer, right", [
    (0.9472, True), (0.947, True), (0.95, True), (94.7, True), (np.float64(0.9472), True),
    (torch.tensor(0.9472, dtype=torch.float64), True), (Fraction(341, 360), True),
    (0.958, False),  # the run's batch-32 line
    (0.753, False),  # its training-mode batch-2 line
    (0.94, False), (0.97, False), ("0.95a", False),
])
def test_eval_mode_judge(answer, right):
    verdict = _judge_eval_mode_accuracy({}, {"eval_mode_accuracy": np.array(
        answer_text(answer)), "eval_mode_feature_21_mean": np.array("-0.1886")})
    assert (verdict is None) == right, verdict


@pytest.mark.parametrize("answer, right", [
    (-0.1886, True), (-0.189, True), (np.float32(-0.18859), True), (Fraction(-19, 100), True),
    (torch.tensor(-0.1886), True), (np.array(-0.1886), True),
    (0.0, False), (-0.0446, False), (-0.2667, False), (0.5658, False), (0.1886, False),
    (None, False),
])
def test_eval_mode_feature_mean_judge(answer, right):
    verdict = _judge_eval_mode_accuracy({}, {"eval_mode_accuracy": np.array("0.9472"),
                                             "eval_mode_feature_21_mean": np.array(
                                                 answer_text(answer))})
    assert (verdict is None) == right, verdict


def test_eval_mode_judge_names_the_line_copied():
    def verdict(answer):
        return _judge_eval_mode_accuracy({}, {"eval_mode_accuracy": np.array(repr(answer)),
                                              "eval_mode_feature_21_mean": np.array("-0.1886")})
    assert "batch-32 line" in verdict(0.958)
    assert "batch-2 line" in verdict(0.753)
    assert "line" not in verdict(0.80)


RELEASE = REPO / "release" / "02_rows_versus_columns" / "02_rows_versus_columns.ipynb"


def _released_texts():
    """Every cell's text in the student's notebook, folded answers included: a
    student can unfold them before answering."""
    return ["".join(cell["source"]) for cell in json.loads(RELEASE.read_text())["cells"]]


def _numbers(text):
    """The decimal numbers a text states, a percentage as its fraction too."""
    found = []
    for match in re.finditer(r"-?\d[\d,]*(?:\.\d+)?%?", text):
        figure = match.group().replace(",", "")
        value = float(figure.rstrip("%"))
        found += [value, value / 100] if figure.endswith("%") or "." in figure else [value]
    return found


def test_the_release_states_neither_judged_figure_of_the_eval_mode_run():
    """Question 2's figures come only from the student's own run: no text states a
    number the judge would accept (a copied -0.19 scored where the run printed -0.04)."""
    for text in _released_texts():
        for value in _numbers(text):
            assert abs(value - EVAL_MODE_FEATURE_MEAN) > 0.005, text
            assert abs(value - float(EVAL_MODE_ACCURACY)) > RUN_TOLERANCE, text


def test_the_release_states_no_count_of_question_1():
    """Exercise 11's question 1 asks how many values one statistic is taken over:
    the text, folded answers included, states none of the three counts."""
    counts = values_per_statistic()
    texts = _released_texts()
    flat = counts["flat_bn_values_at_2"]
    for text in texts:
        assert not re.search(rf"over (two|{flat}) values", text), text
        for value in _numbers(text):
            assert value not in (counts["spatial_bn_values_at_2"],
                                 counts["group_norm_values_at_2"]), text

"""Unit 01 checks, the student-facing half: how each exercise is called."""

import numpy as np

from normref.checks._runner import run_check


def _call_on_x(fn, case):
    return {"y": fn(case["x"].copy())}


def _call_layer_norm(layer_norm, case):
    x, gamma, beta = case["x"].copy(), case["gamma"].copy(), case["beta"].copy()
    return {"y": layer_norm(x, gamma, beta, float(case["eps"]))}


def _answers_as_text(answers, case):
    return {name: np.array(str(value)) for name, value in answers.items()}


def check_token_mean(token_mean):
    """Check token_mean(x) -> the mean of each token (last axis)."""
    run_check("token_mean", token_mean, _call_on_x)


def check_token_var(token_var):
    """Check token_var(x) -> the biased variance of each token (last axis)."""
    run_check("token_var", token_var, _call_on_x)


def check_layer_norm_token(layer_norm):
    """Check layer_norm(x, gamma, beta, eps) on single tokens (1-D x)."""
    run_check("layer_norm_token", layer_norm, _call_layer_norm)


def check_layer_norm_batches(layer_norm):
    """Check layer_norm(x, gamma, beta, eps) on 2-D and 3-D batches of tokens."""
    run_check("layer_norm_batches", layer_norm, _call_layer_norm)


def check_predictions(**answers):
    """Check the predict-first answers of unit 01, given by keyword."""
    run_check("recipe_predictions", answers, _answers_as_text)

"""Every subcommand's options reach the function it calls (the parser is the only
thing between a person and the grader)."""

from autograder.cli import build_parser


def test_bench_takes_engines_and_grade_takes_its_cluster_options():
    args = build_parser().parse_args(["bench", "--handins", "8", "--engines"])
    assert (args.handins, args.engines) == (8, True)
    args = build_parser().parse_args(["grade", "01_the_recipe", "--student", "a",
                                      "--student", "b", "--scheduler", "tcp://h:8786",
                                      "--engine", "pool", "--no-scaled-timeouts"])
    assert args.student == ["a", "b"] and args.scheduler == "tcp://h:8786"
    assert args.engine == "pool" and args.no_scaled_timeouts

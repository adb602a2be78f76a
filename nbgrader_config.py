"""nbgrader's configuration for the course; the course root is this folder."""

c = get_config()  # noqa: F821 (nbgrader provides get_config)

c.CourseDirectory.source_directory = "source"
c.CourseDirectory.release_directory = "release"
c.CourseDirectory.submitted_directory = "submitted"
c.CourseDirectory.autograded_directory = "autograded"
c.CourseDirectory.feedback_directory = "feedback"
c.CourseDirectory.db_url = "sqlite:///gradebook.db"

# A first cell that imports torch takes several seconds on 2 cores.
c.ExecutePreprocessor.timeout = 120
c.Execute.timeout = 120

# Released notebooks carry no outputs and no solution text.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# The course collects hand-ins with `python -m autograder collect`, not through
# nbgrader's exchange; the formgrader still looks for one, so give it a folder of
# the course's own (made here, never committed) instead of /usr/local/share.
import os  # noqa: E402

_exchange = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".exchange")
os.makedirs(_exchange, exist_ok=True)
c.Exchange.root = _exchange

"""Every lesson runs top to bottom on the student edition's packages alone, and its
sliders and menus work under Colab's ipywidgets 7.7: the edition's environment
(shared with tests/publishing/test_edition_environment.py, which checks that it
installs from the pins and imports what the lessons import) with Colab's ipywidgets
in front of it, nothing of this repository importable. This is the lessons' one full
run outside this repository's own environment. COURSE_SKIP_EDITION_VENV=1 skips them.
"""

import pytest
from test_publish import (  # noqa: F401 - edition, edition_env, colab_widgets_env: fixtures
    COLAB_IPYWIDGETS,
    SKIP_VENV,
    _check_widgets,
    _lesson_run,
    colab_widgets_env,
    edition,
    edition_env,
)

from conftest import LESSONS


@SKIP_VENV
@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_each_lessons_widgets_work_under_colabs_ipywidgets_7(lesson, edition,
                                                              colab_widgets_env, tmp_path):
    errors, report = _lesson_run(colab_widgets_env, edition, lesson, tmp_path)
    assert not errors, f"{lesson.name} under ipywidgets {COLAB_IPYWIDGETS}: {errors}"
    _check_widgets(report, lesson.name, COLAB_IPYWIDGETS)
    assert report["controls"], f"{lesson.name}: no slider or menu found"

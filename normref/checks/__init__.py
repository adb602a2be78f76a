"""One check per graded exercise; hidden test cells call them, one call a cell:

    from normref.checks import check_layer_norm_batches
    check_layer_norm_batches(layer_norm)

Each `*_probes.py` module holds the student-facing half of its unit's checks
(how to call the student's code); each `*_judges.py` the grader-facing half
(inputs and verdicts, with the references). Only the probes and the runner are
shipped into the grading sandbox.
"""

import importlib
import pkgutil

from normref.checks._runner import CheckFailed

__all__ = ["CheckFailed"]

for _info in pkgutil.iter_modules(__path__):
    if _info.name.endswith("_probes"):
        _module = importlib.import_module(f"{__name__}.{_info.name}")
        for _name in dir(_module):
            if _name.startswith("check_"):
                globals()[_name] = getattr(_module, _name)
                __all__.append(_name)

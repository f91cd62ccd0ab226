import os
import sys

# Tests import the package from the source tree (operator/ is the source root) even when it
# is not installed; an installed copy is used in the packaging test only.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "operator"))

import pytest

# In CI every dependency is installed by .ci/run, so a skipped test means something is missing:
# count it as a failure rather than let it pass silently. Locally a skip stays a skip.
STRICT = os.environ.get("CI") == "true" or os.environ.get("TPUTORCH_NO_SKIP") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if STRICT and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped, which CI counts as a failure: {report.longrepr}"

"""The KubeRay and Kueue versions `make test` runs the operator against (hack/build.sh builds them
for the local cluster): what `tputorch doctor` names when it finds another version, and what
docs/compatibility.md and CHANGELOG.md's "Tested with" state (tests/unit/test_tested_versions.py
holds the three to each other). A version here is one the suite ran, not one that was read about.
"""

KUBERAY = ("1.6.2",)
KUEUE = ("0.19.1",)


def shown(versions: tuple[str, ...]) -> str:
    """'1.6.2' or '1.6.2 and 1.7.0', as the doctor and the docs say them."""
    return " and ".join(filter(None, (", ".join(versions[:-1]), versions[-1])))

"""tputorch: run distributed PyTorch on one GKE TPU slice through KubeRay."""

# The one version of the package, the chart (version and appVersion) and the image tag; the release
# is CHANGELOG.md's entry of the same number (hack/release.py refuses a release where they disagree).
__version__ = "0.3.0"

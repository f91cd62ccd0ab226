"""tputorch: run distributed PyTorch on one GKE TPU slice through KubeRay."""

__version__ = "0.1.0"

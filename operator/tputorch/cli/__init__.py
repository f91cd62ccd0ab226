"""The `tputorch` command (main): the user commands (submit/serve in submit, get/describe/logs/delete/wait
in manage), their API client and the progress display, and the operator's own `run`/`render`/`validate`."""

"""The `tputorch` command (main): the user commands (submit/serve in submit, get/describe/logs/delete/wait
in manage), their API client (client) and what they show (display), `tputorch doctor` (the doctor
package), and the operator's own `run`/`render`/`validate`."""

"""The API of both kinds, pure: the slice table (topology), the specs and every validation rule (spec),
and the CRDs generated from the same source (crd). Imports nothing from controller/ or cli/."""

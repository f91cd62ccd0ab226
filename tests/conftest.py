import os
import sys

# Tests import the package from the source tree (operator/ is the source root) even when it
# is not installed; an installed copy is used in the packaging test only.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "operator"))

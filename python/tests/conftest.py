import os
import sys

# The tests share helpers.py beside them.
sys.path.insert(0, os.path.dirname(__file__))

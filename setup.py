"""The one thing pyproject.toml cannot say: which packages ship. The found ones plus `parley.configs`, which is the
top-level configs/ (pyproject's package-dir maps it); a find only discovers folders already inside a package."""
from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["cli*", "parley*", "voice*", "llm_engine*", "web*", "desktop*"]), "parley.configs"])

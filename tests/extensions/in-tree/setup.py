from setuptools import Extension, setup

setup(packages=["in_tree"], ext_modules=[Extension("in_tree._native", ["csrc/native.c"])])

from setuptools import Extension, setup

setup(ext_modules=[Extension("plain_c._native", ["src/native.c"])])

"""Run by python/meson.build with the Python the package installs into:
prints that torch's version, library directory, C++11 ABI flag (0/1) and
include directories, one per line."""
import os

import torch
import torch.utils.cpp_extension as ext

print(torch.__version__)
print(os.path.join(os.path.dirname(torch.__file__), "lib"))
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
for d in ext.include_paths():
    if os.path.isdir(d):
        print(d)

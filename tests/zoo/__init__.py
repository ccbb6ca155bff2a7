"""A zoo of plain-PyTorch kernels written from other standard formulas, with buggy twins (user kernels)."""

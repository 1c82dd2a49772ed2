"""extmatrix: build and test a PyTorch extension across torch versions and accelerator flavors."""

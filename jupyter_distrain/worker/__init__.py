"""What every launched process runs before the user's ``train.py``."""

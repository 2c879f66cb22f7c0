"""``python -m cellblock.guest``: run one leg of a cell."""

from cellblock.guest._agent import main

main()

"""``python -m experiments.train``: see `experiments.train.run`."""

from experiments.train.run import main

if __name__ == "__main__":
    main()

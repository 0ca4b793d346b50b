"""The sensors a code location runs: micro-batch requests, window closes, unfinished commit sequences, dead runs."""

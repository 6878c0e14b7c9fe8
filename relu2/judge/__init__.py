"""Judging: the rule, the noise models, the gate, its report, learning the models."""

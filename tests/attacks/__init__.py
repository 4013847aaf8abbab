"""Hostile submissions (issue 17): each one scored > 0 against the grader before the trust-model rewrite."""

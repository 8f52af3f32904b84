//! Helpers for the whole-system tests in `tests/tests/`.

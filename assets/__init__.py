"""Windowed-output assets (one time-window partition per event-time window) and their asset checks."""

"""Branches arrive with their own issue; the app exists so the layout is stable."""

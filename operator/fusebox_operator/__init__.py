"""Fusebox operator: reconciles InferenceServices and keeps their pods serving."""

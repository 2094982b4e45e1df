"""parapipe: plan and run DNN inference across the processing units of edge boards."""

__version__ = "0.1.0"

"""The paper's operators (section 2.4: session reconstruction, windowed
duration statistics) and the dataflow built from them. Test pipelines built on it live in
``flux.testing.dataflows``."""
from flux.examples.dataflows import paper_dataflow, paper_stages, vectorized_dataflow
from flux.examples.sessions import SessionReconstruction, session_key
from flux.examples.stats import DEFAULT_WINDOW, WindowedDurationStats, stats_key

__all__ = [
    "paper_dataflow", "paper_stages", "vectorized_dataflow", "SessionReconstruction", "session_key",
    "DEFAULT_WINDOW", "WindowedDurationStats", "stats_key",
]

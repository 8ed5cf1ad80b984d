"""Process plumbing: topology (ranks, backends), lost ranks, stop signals, stages as processes, an ordered process
pool."""

"""Block tables: the host mirror of every request's pages (the single source of truth) and its device copies."""

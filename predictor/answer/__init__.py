"""The answers every front end gives: the exact replay and the routing between methods."""

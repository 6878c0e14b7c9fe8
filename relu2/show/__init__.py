"""Showing: the sweep's table, the plots, the dashboard, relu2 inspect."""

"""Post-incident comparison reports, and the pooled figures the demo prints."""

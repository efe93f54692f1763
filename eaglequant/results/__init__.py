"""Result contracts: every result that crosses a boundary, one typed, schema-versioned
type each (the validation, compare, engine and tune reports, the export manifest,
spec-decode counts), and what each records of its making (environment, provenance,
binding, workload). Torch-free: every reader of a report imports only this."""

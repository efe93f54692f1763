"""The torch EAGLE-3 draft module, its loader and checks, shared by export, validate and toy."""

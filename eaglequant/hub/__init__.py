"""What goes to the Hugging Face Hub: the model card (``card``), the public names it shows
instead of this machine's paths (``public``), and the upload (``publish``)."""

"""What people read: terminal tables and the Hugging Face model card."""

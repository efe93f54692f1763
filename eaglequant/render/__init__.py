"""What people read: terminal tables, validation and compare tables, tune's Markdown and
predictions, JUnit XML (the model card that prints them is ``eaglequant.hub``)."""

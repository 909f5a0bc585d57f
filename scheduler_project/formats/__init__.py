"""Display formats (FORMAT_MODULE_PATH) for the admin and every other template."""

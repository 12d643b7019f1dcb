"""The project as a whole: the code's layout, the errors' classes, the CLI's error lines."""

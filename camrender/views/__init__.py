"""Looking at a camera path without the model: plots and proxy-scene previews."""

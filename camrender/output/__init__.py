"""The video writers: `video.VideoWriter` (one mp4, written to a temporary file and renamed) and
`segment_video.SegmentVideoWriter` (one mp4 per segment, joined when the render completes)."""

"""The summary of a batch: counts, failures, seconds per video (`summarize`) and its printed lines."""
from __future__ import annotations


def summarize(planned: list, results: list, seconds: float, workers: int, per_video: int, loads: list) -> dict:
    """The batch summary: counts, failures, seconds per video and videos per minute. results: the rendered jobs'
    result dicts (`camrender.batch.executors.render_job`); workers: how many video groups rendered; loads: the
    model loads of each."""
    failed = [{"where": job.where, "out": job.out, "reason": job.reason} for job in planned if job.status == "failed"]
    failed += [{"where": r["where"], "out": r["out"], "reason": r["reason"]} for r in results if r["status"] == "failed"]
    done = [r for r in results if r["status"] == "done"]
    return {
        "jobs": len(planned),
        "done": len(done),
        "skipped": sum(job.status == "skipped" for job in planned),
        "failed": len(failed),
        "failures": failed,
        "seconds": round(seconds, 3),
        "seconds_per_video": round(sum(r["seconds"] for r in done) / len(done), 3) if done else None,
        "videos_per_minute": round(60.0 * len(done) / seconds, 3) if done and seconds > 0 else 0.0,
        "ranks": workers * per_video,
        "gpus_per_video": per_video,
        "model_loads_per_rank": loads,
        "results": sorted(results, key=lambda r: r["index"]),
    }


def summary_lines(summary: dict) -> list:
    """The summary as the lines `camrender batch` prints."""
    per_video = summary["seconds_per_video"]
    lines = [f"batch: {summary['done']} done, {summary['skipped']} skipped (output exists), {summary['failed']} "
             f"failed of {summary['jobs']} jobs in {summary['seconds']:.1f} s on {summary['ranks']} rank(s)"
             + (f": {per_video:.1f} s per video, {summary['videos_per_minute']:.2f} videos per minute"
                if per_video is not None else "")]
    lines += [f"failed: {failure['reason']}" for failure in summary["failures"]]
    return lines

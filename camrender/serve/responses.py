"""What the server answers, as JSON or text: the job object (`job_object`, the OpenAI Videos API's fields with
camrender's beside them), a page of jobs (`job_list`) and the Prometheus metrics (`metrics_text`)."""
from __future__ import annotations

import math
from typing import Optional

from camrender.serve.store import STATUSES, Job

SECONDS_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, math.inf)  # seconds per job, the histogram's upper bounds


def _whole(seconds: Optional[float]) -> Optional[int]:
    return None if seconds is None else int(seconds)


def job_object(job: Job, model: str, keep_s: float) -> dict:
    """The job object of `job` (times in unix seconds; a finished job expires `keep_s` after it finished)."""
    summary = job.summary
    waited = None if job.started_at is None else round(job.started_at - job.created_at, 3)
    return {
        "id": job.id, "object": "video", "model": model, "status": job.status, "progress": job.progress,
        "created_at": _whole(job.created_at), "completed_at": _whole(job.completed_at),
        "expires_at": None if job.completed_at is None else _whole(job.completed_at + keep_s),
        "size": summary["size"], "seconds": summary["seconds"], "prompt": summary["prompt"], "error": job.error,
        # camrender's
        "num_frames": summary["num_frames"], "fps": summary["fps"], "seed": summary["seed"], "mode": summary["mode"],
        "stage": job.stage, "segments_done": job.segments_done, "segments_total": job.segments_total,
        "eta_seconds": job.eta_s, "wait_seconds": waited, "inference_time_s": job.inference_s,
        "attempts": job.attempts, "notes": summary["notes"], "user": summary["user"],
    }


def job_list(jobs: list, has_more: bool, model: str, keep_s: float) -> dict:
    return {"object": "list", "data": [job_object(job, model, keep_s) for job in jobs],
            "first_id": jobs[0].id if jobs else None, "last_id": jobs[-1].id if jobs else None, "has_more": has_more}


def metrics_text(counts: dict, render_seconds: list, busy: int, slots: int) -> str:
    """Prometheus' text format: queue length, jobs by status, seconds per completed job (a histogram over the
    jobs the store holds), renders running of the slots."""
    lines = ["# HELP camrender_serve_queue_length Jobs waiting to render.",
             "# TYPE camrender_serve_queue_length gauge", f"camrender_serve_queue_length {counts['queued']}",
             "# HELP camrender_serve_jobs Jobs in the store by status.", "# TYPE camrender_serve_jobs gauge"]
    lines += [f'camrender_serve_jobs{{status="{status}"}} {counts[status]}' for status in STATUSES]
    lines += ["# HELP camrender_serve_renders_running Renders running now, of camrender_serve_render_slots.",
              "# TYPE camrender_serve_renders_running gauge", f"camrender_serve_renders_running {busy}",
              "# HELP camrender_serve_render_slots Renders the server runs at once.",
              "# TYPE camrender_serve_render_slots gauge", f"camrender_serve_render_slots {slots}",
              "# HELP camrender_serve_job_seconds Seconds each completed job rendered.",
              "# TYPE camrender_serve_job_seconds histogram"]
    for bound in SECONDS_BUCKETS:
        label = "+Inf" if math.isinf(bound) else f"{bound:g}"
        lines.append(f'camrender_serve_job_seconds_bucket{{le="{label}"}} '
                     f"{sum(seconds <= bound for seconds in render_seconds)}")
    lines += [f"camrender_serve_job_seconds_sum {sum(render_seconds):.3f}",
              f"camrender_serve_job_seconds_count {len(render_seconds)}"]
    return "\n".join(lines) + "\n"

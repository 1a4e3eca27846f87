"""`camrender serve`: a render service with the OpenAI-style video job API that SGLang-diffusion and vLLM-Omni speak
(/v1/videos), on a job store that outlives the server.

- `store`: the job store (SQLite, WAL) and each job's folder of uploads and video;
- `fields`: what a request may hold, from which engine, and what is refused (the docs' compatibility table);
- `values`, `body`: a request body and its fields read as their kinds;
- `jobs`: a request -> a checked job, through `camrender.api.requests.plan_request` (the CLI's checks);
- `progress`: a render's progress -> the job's status, and the stop check of a cancel;
- `worker`: the `Renderer` protocol (`InProcessRenderer`) and the `Dispatcher` of queued jobs;
- `ray_renderer`: `RayRenderer`, the jobs rendered by the Ray workers of `camrender batch --executor ray`;
- `responses`, `errors`: the job object, pages, metrics and JSON errors;
- `app`: the aiohttp routes, the token and Host checks, and `serve`.

The command itself is `camrender.cli.serve`. See docs/serve.md.
"""

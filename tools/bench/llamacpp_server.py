#!/usr/bin/env python3
"""llamacpp_server.py - starts llama-cpp-python's OpenAI-compatible server for bench_serve.py with
use_extra_bufts = False. That field of llama.cpp's llama_model_params (the repacked CPU weight
buffers, whose AMX path crashes on this CPU) is not exposed by the server's settings nor by the
Llama class, so this launcher wraps llama_model_default_params before the model is created and then
runs the stock app (create_app + uvicorn) with the given model settings, requests queued rather than
interrupted.
usage: llamacpp_server.py --model F.gguf --port N [--threads 2] [--n-ctx 8192]"""
import argparse

import llama_cpp.llama_cpp as lc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=8192)
    a = ap.parse_args()
    default_params = lc.llama_model_default_params

    def params_without_extra_bufts():
        p = default_params()
        p.use_extra_bufts = False
        return p
    lc.llama_model_default_params = params_without_extra_bufts

    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings
    ms = ModelSettings(model=a.model, model_alias="m", n_threads=a.threads, n_threads_batch=a.threads, n_ctx=a.n_ctx,
                       n_batch=512, verbose=False)
    # interrupt_requests=False: by default a new request aborts the one being streamed, which would
    # count cut-off answers as served requests
    app = create_app(server_settings=ServerSettings(host="127.0.0.1", port=a.port, interrupt_requests=False),
                     model_settings=[ms])
    uvicorn.run(app, host="127.0.0.1", port=a.port, log_level="warning")


if __name__ == "__main__":
    main()

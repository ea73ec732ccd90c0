import pytest

from naiad.frontends.http.routes import Route, match


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("/v2", Route("server_metadata")),
        ("/v2/health/live", Route("live")),
        ("/v2/health/ready", Route("ready_server")),
        ("/v2/models/stats", Route("stats_all")),
        ("/v2/models/simple", Route("model_metadata", "simple")),
        ("/v2/models/simple/versions/2", Route("model_metadata", "simple", 2)),
        ("/v2/models/simple/versions/2/infer", Route("model_infer", "simple", 2)),
        ("/v2/models/simple/ready", Route("model_ready", "simple")),
        ("/v2/models/simple/config", Route("model_config", "simple")),
        ("/v2/models/simple/versions/1/stats", Route("model_stats", "simple", 1)),
        ("/v2/repository/index", Route("index")),
        ("/v2/repository/models/simple/load", Route("load", "simple")),
        ("/v2/repository/models/simple/unload", Route("unload", "simple")),
        ("/v2/logging", Route("logging")),
        ("/v2/systemsharedmemory/status", Route("shm_status")),
        ("/v2/systemsharedmemory/region/in0/status", Route("shm_status", region="in0")),
        ("/v2/systemsharedmemory/region/in0/register", Route("shm_register", region="in0")),
        ("/v2/systemsharedmemory/register", Route("shm_register")),
        ("/v2/systemsharedmemory/unregister", Route("shm_unregister")),
        ("/v2/systemsharedmemory/region/in0/unregister", Route("shm_unregister", region="in0")),
        ("/v2/cudasharedmemory/status", Route("cuda_status")),
        ("/v2/cudasharedmemory/region/c/register", Route("cuda_register", region="c")),
        ("/v2/cudasharedmemory/region/c/unregister", Route("cuda_unregister", region="c")),
    ],
)
def test_known_paths(path, route):
    assert match(path) == route


@pytest.mark.parametrize(
    "path",
    ["/v1/models/x", "/console", "/console/", "/console/../x.js", "/console/a/b.js", "/console/api/models/m/x",
     "/v2/models/simple/versions/abc", "/v2/models/simple/explode", "/v2/models",
     "/v2/systemsharedmemory", "/v2/systemsharedmemory/region/a/b/status", "/v2/systemsharedmemory/region//status",
     "/v2/systemsharedmemory/region/a/delete"],
)
def test_unknown_paths(path):
    assert match(path) is None


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("/", Route("console_page")),
        ("/console/app.js", Route("console_asset", asset="app.js")),
        ("/console/favicon.svg", Route("console_asset", asset="favicon.svg")),
        ("/console/api/live", Route("console_live")),
        ("/console/api/models/simple/config.pbtxt", Route("console_config", "simple")),
        ("/console/api/models/simple/versions/2/config.pbtxt", Route("console_config", "simple", 2)),
        ("/console/api/models/simple/infer", Route("console_infer", "simple")),
        ("/console/api/models/simple/versions/1/infer", Route("console_infer", "simple", 1)),
    ],
)
def test_console_paths(path, route):
    assert match(path) == route

# Collected only under the extension's own pytest settings (setup.cfg: python_files).
def test_the_settings_came_along():
    pass

"""Packaging for paged-infer: everything comes from settings.ini (nbdev 2 style)."""
from configparser import ConfigParser
import setuptools

config = ConfigParser(delimiters=['='])
config.read('settings.ini', encoding='utf-8')
cfg = config['DEFAULT']

licenses = {'apache2': ('Apache Software License 2.0', 'OSI Approved :: Apache Software License')}
statuses = ['1 - Planning', '2 - Pre-Alpha', '3 - Alpha', '4 - Beta', '5 - Production/Stable']
py_versions = '3.10 3.11 3.12 3.13'.split()

lic = licenses[cfg['license']]
min_python = cfg['min_python']
requirements = cfg.get('requirements', '').split()
dev_requirements = cfg.get('dev_requirements', '').split()
plots_requirements = cfg.get('plots_requirements', '').split()

setuptools.setup(
    name=cfg['repo'],
    version=cfg['version'],
    license=lic[0],
    classifiers=[
        'Development Status :: ' + statuses[int(cfg['status'])],
        'Intended Audience :: ' + cfg['audience'].title(),
        'License :: ' + lic[1],
        'Natural Language :: ' + cfg['language'].title(),
    ] + ['Programming Language :: Python :: ' + v for v in py_versions[py_versions.index(min_python):]],
    url=cfg['git_url'],
    packages=setuptools.find_packages(include=[cfg['lib_name'], cfg['lib_name'] + '.*']),
    include_package_data=True,
    install_requires=requirements,
    extras_require={'dev': dev_requirements, 'plots': plots_requirements},
    python_requires='>=' + min_python,
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    zip_safe=False,
    entry_points={
        'console_scripts': cfg['console_scripts'].split(),
        'nbdev': [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"],
    },
    author=cfg['author'],
    author_email=cfg['author_email'],
    description=cfg['description'],
    keywords=cfg['keywords'],
)
